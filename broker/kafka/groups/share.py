"""KIP-932 share groups, group side, as a pure state machine: membership (ShareGroupHeartbeat),
epochs and the share assignor.

A share group is a queue over topics: its members consume the same partitions together and
acknowledge records one by one (the partition side, ShareFetch/ShareAcknowledge, tracks which
member holds which record). So membership is simpler than in a KIP-848 consumer group:

- a partition may be assigned to several members at once, so nothing is revoked before it is
  given to another member: a member's epoch moves to the group's assignment epoch as soon as
  it heartbeats, and the new assignment comes with that heartbeat;
- the group epoch is bumped when a member joins or leaves, a subscription changes, or a
  subscribed topic appears, disappears or gains partitions; the target assignment is then
  recomputed (`simple_assign`);
- a heartbeat with an epoch other than the member's (or the one before, whose answer may have
  been lost) gets FENCED_MEMBER_EPOCH, and the client rejoins with epoch 0;
- a member silent for the session timeout is removed (the records it holds go back to the
  queue when their acquisition locks run out, on the partition side).

Member ids are chosen by the client (KIP-1082), never by the coordinator.

Durability: every change writes the group's whole state as one record to its
`__consumer_offsets` partition (log.py `ShareGroupKey`), so members and epochs survive a
coordinator move or a broker death, and members heartbeat on unaffected.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.consumer import (
    Partitions,
    TopicView,
    _parts_from_json,
    _parts_json,
    flatten,
    nest,
)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
RECORD_VERSION = 1

# Kafka's ShareGroupState names, as ListGroups and ShareGroupDescribe spell them
EMPTY = "Empty"
STABLE = "Stable"
SHARE_GROUP_STATES = (EMPTY, STABLE)

SIMPLE_ASSIGNOR = "simple"

# why a member was fenced (metrics)
FENCED_EPOCH = "epoch"
SESSION_TIMEOUT = "session_timeout"
FENCING_REASONS = (FENCED_EPOCH, SESSION_TIMEOUT)


@dataclass(slots=True)
class ShareMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: Partitions = field(default_factory=dict)
    # not persisted: time and what the client was last told
    last_heartbeat_ms: int = 0
    sent: frozenset[tuple[uuid.UUID, int]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.member_id,
            "rack": self.rack_id,
            "client": self.client_id,
            "host": self.client_host,
            "topics": list(self.subscribed_topic_names),
            "epoch": self.member_epoch,
            "previous_epoch": self.previous_member_epoch,
            "assigned": _parts_json(self.assigned),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], now_ms: int) -> ShareMember:
        return cls(
            member_id=str(raw["id"]),
            rack_id=raw.get("rack"),
            client_id=str(raw.get("client", "")),
            client_host=str(raw.get("host", "")),
            subscribed_topic_names=tuple(str(t) for t in raw.get("topics", ())),
            member_epoch=int(raw["epoch"]),
            previous_member_epoch=int(raw.get("previous_epoch", -1)),
            assigned=_parts_from_json(raw.get("assigned", {})),
            last_heartbeat_ms=now_ms,
        )


@dataclass(slots=True)
class ShareGroupData:
    """The share-group part of a group (`Group.share`)."""

    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    target: dict[str, Partitions] = field(default_factory=dict)  # member id -> target assignment
    # the subscribed topics' (name, id, partitions) the target was computed from
    topics_signature: tuple[tuple[str, str, int], ...] = ()
    # share-partitions whose state the partition leaders were asked to create (Kafka's
    # InitializeShareGroupState): done when a partition first enters the target assignment, so
    # share.auto.offset.reset=latest counts from the assignment, not from the first fetch
    initialized: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    # every member's subscribed topic names together; None after a membership or subscription
    # change (not persisted: a steady heartbeat must not walk every member)
    subscribed: frozenset[str] | None = field(default=None, compare=False, repr=False)

    def state_name(self) -> str:
        return STABLE if self.members else EMPTY

    def subscribed_topics(self, topics: TopicView | None = None) -> set[str]:
        if self.subscribed is None:
            self.subscribed = frozenset(n for m in self.members.values() for n in m.subscribed_topic_names)
        names = set(self.subscribed)
        if topics is not None:
            names = {n for n in names if n in topics}
        return names

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "v": RECORD_VERSION,
                "group_epoch": self.group_epoch,
                "assignment_epoch": self.assignment_epoch,
                "members": [m.to_json() for m in self.members.values()],
                "target": {mid: _parts_json(parts) for mid, parts in self.target.items()},
                "signature": [list(s) for s in self.topics_signature],
                "init": _parts_json(nest(self.initialized)),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes, now_ms: int) -> ShareGroupData:
        doc = json.loads(raw)
        if doc.get("v") != RECORD_VERSION:
            raise ValueError(f"unsupported share group record version {doc.get('v')}")
        data = cls(group_epoch=int(doc["group_epoch"]), assignment_epoch=int(doc["assignment_epoch"]))
        for m in doc.get("members", ()):
            member = ShareMember.from_json(m, now_ms)
            data.members[member.member_id] = member
        data.target = {mid: _parts_from_json(p) for mid, p in doc.get("target", {}).items()}
        data.topics_signature = tuple((str(n), str(i), int(c)) for n, i, c in doc.get("signature", ()))
        data.initialized = set(flatten(_parts_from_json(doc.get("init", {}))))
        return data

    def uninitialized(self) -> set[tuple[uuid.UUID, int]]:
        """Share-partitions in the target assignment whose state was not created yet."""
        wanted: set[tuple[uuid.UUID, int]] = set()
        for parts in self.target.values():
            wanted |= flatten(parts)
        return wanted - self.initialized


# ---------------------------------------------------------------- the assignor


def simple_assign(
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    partitions: Mapping[uuid.UUID, int],
    previous: Mapping[str, Partitions],
) -> dict[str, Partitions]:
    """Kafka's simple share assignor semantics, per topic: every partition of a subscribed
    topic goes to at least one of its subscribers, and every subscriber gets at least one
    partition of it. With fewer subscribers than partitions each partition has one owner and
    the counts differ by at most one; with more subscribers than partitions the members are
    spread over the partitions (each partition shared by about members/partitions of them).
    Previous owners keep what they had while that stays within those bounds, so a join or a
    leave moves few partitions (the partition side keeps working on what it has)."""
    out: dict[str, Partitions] = {m: {} for m in subscriptions}
    load = dict.fromkeys(subscriptions, 0)  # across topics, so extra partitions rotate
    for topic in sorted(partitions, key=str):
        count = partitions[topic]
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        if not members or count <= 0:
            continue
        owners: dict[int, list[str]] = {p: [] for p in range(count)}
        if len(members) <= count:
            # each partition one owner; each member floor or ceil of count/len(members)
            low, extra = divmod(count, len(members))
            quota = dict.fromkeys(members, low)
            for m in sorted(members, key=lambda m: (load[m], m))[:extra]:
                quota[m] += 1
            free = set(range(count))
            have = dict.fromkeys(members, 0)
            for m in members:
                for p in sorted(previous.get(m, {}).get(topic, ())):
                    if p in free and have[m] < quota[m]:
                        owners[p].append(m)
                        free.discard(p)
                        have[m] += 1
            rest = sorted(free)
            for m in sorted(members, key=lambda m: (load[m], m)):
                while have[m] < quota[m]:
                    owners[rest.pop(0)].append(m)
                    have[m] += 1
        else:
            # each member one partition; each partition floor or ceil of len(members)/count
            per, extra = divmod(len(members), count)
            cap = {p: per + (1 if p < extra else 0) for p in range(count)}
            placed: set[str] = set()
            for m in members:
                for p in sorted(previous.get(m, {}).get(topic, ())):
                    if p < count and m not in placed and len(owners[p]) < cap[p]:
                        owners[p].append(m)
                        placed.add(m)
            for m in members:
                if m in placed:
                    continue
                p = min(range(count), key=lambda q: (len(owners[q]) - cap[q], q))
                owners[p].append(m)
                placed.add(m)
        for p, ms in owners.items():
            for m in ms:
                out[m].setdefault(topic, set()).add(p)
                load[m] += 1
    return out


# ---------------------------------------------------------------- requests and rules


@dataclass(frozen=True, slots=True)
class ShareHeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: tuple[str, ...] | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class ShareHeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    assignment: Partitions | None = None  # None: unchanged since the member was last told


def share_error(code: ErrorCode, message: str | None = None, member_id: str | None = None) -> ShareHeartbeatResult:
    return ShareHeartbeatResult(code, message, member_id)


def validate(req: ShareHeartbeatRequest) -> ShareHeartbeatResult | None:
    """Kafka's request checks (INVALID_REQUEST with its messages), before any state is read."""
    if not req.group_id:
        return share_error(ErrorCode.invalid_request, "GroupId can't be empty.")
    if not req.member_id.strip():
        return share_error(ErrorCode.invalid_request, "MemberId can't be empty.")
    if req.rack_id is not None and not req.rack_id.strip():
        return share_error(ErrorCode.invalid_request, "RackId can't be empty.")
    if req.member_epoch < LEAVE_EPOCH:
        return share_error(ErrorCode.invalid_request, f"MemberEpoch {req.member_epoch} is invalid.")
    if req.member_epoch == JOIN_EPOCH and not req.subscribed_topic_names:
        return share_error(ErrorCode.invalid_request, "SubscribedTopicNames must be set in first request.")
    return None


class ShareGroupRules:
    """The protocol's transitions over one group's `ShareGroupData`. Stateless: the manager
    passes the data, the topic view, the limits and the time."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size

    def heartbeat(
        self, group_id: str, data: ShareGroupData, req: ShareHeartbeatRequest, topics: TopicView, now_ms: int
    ) -> tuple[ShareHeartbeatResult, bool]:
        """Answer one heartbeat: (result, whether the group's persisted state changed). Changes
        are tracked as they are made: a steady heartbeat serializes nothing (the group's record
        grows with members x partitions, and every member heartbeats every few seconds)."""
        member = data.members.get(req.member_id)
        if req.member_epoch == LEAVE_EPOCH:
            if member is None:
                return share_error(
                    ErrorCode.unknown_member_id, f"Member {req.member_id} is not a member of group {group_id}."
                ), False
            self.remove(data, req.member_id)
            self.refresh(data, topics, bump=True)
            return ShareHeartbeatResult(ErrorCode.none, member_id=req.member_id, member_epoch=LEAVE_EPOCH), True
        bump = False
        if req.member_epoch == JOIN_EPOCH:
            if member is None and len(data.members) >= self.max_size:
                return share_error(
                    ErrorCode.group_max_size_reached,
                    f"The share group has reached its maximum capacity of {self.max_size} members.",
                ), False
            if member is not None:
                # rejoining from scratch (it was fenced, or restarted with the same id)
                self.remove(data, req.member_id)
            member = ShareMember(member_id=req.member_id)
            data.members[req.member_id] = member
            data.subscribed = None
            bump = True
        elif member is None:
            return share_error(
                ErrorCode.unknown_member_id, f"Member {req.member_id} is not a member of group {group_id}."
            ), False
        elif req.member_epoch not in (member.member_epoch, member.previous_member_epoch):
            return share_error(
                ErrorCode.fenced_member_epoch,
                f"The share group member has a smaller or larger member epoch ({req.member_epoch}) "
                f"than the one known by the group coordinator ({member.member_epoch}).",
                member.member_id,
            ), False
        member.last_heartbeat_ms = now_ms
        changed = bump
        if req.rack_id is not None and req.rack_id != member.rack_id:
            member.rack_id = req.rack_id
            changed = True
        if req.client_id and req.client_id != member.client_id:
            member.client_id = req.client_id
            changed = True
        if req.client_host and req.client_host != member.client_host:
            member.client_host = req.client_host
            changed = True
        if req.subscribed_topic_names is not None:
            names = tuple(sorted(set(req.subscribed_topic_names)))
            if names != member.subscribed_topic_names:
                member.subscribed_topic_names = names
                data.subscribed = None
                bump = changed = True
        epochs = (data.group_epoch, data.assignment_epoch)
        self.refresh(data, topics, bump=bump)
        changed = changed or epochs != (data.group_epoch, data.assignment_epoch)
        # nothing to revoke in a share group: the member moves to its target at once
        target = data.target.get(member.member_id, {})
        if member.member_epoch != data.assignment_epoch or flatten(member.assigned) != flatten(target):
            member.assigned = {t: set(ps) for t, ps in target.items() if ps}
            if member.member_epoch != data.assignment_epoch:
                member.previous_member_epoch = member.member_epoch
                member.member_epoch = data.assignment_epoch
            changed = True
        current = flatten(member.assigned)
        send: Partitions | None = None
        if req.member_epoch == JOIN_EPOCH or member.sent != current:
            member.sent = current
            send = {t: set(ps) for t, ps in member.assigned.items()}
        result = ShareHeartbeatResult(
            ErrorCode.none, member_id=member.member_id, member_epoch=member.member_epoch, assignment=send
        )
        return result, changed

    @staticmethod
    def remove(data: ShareGroupData, member_id: str) -> ShareMember | None:
        data.subscribed = None
        data.target.pop(member_id, None)
        return data.members.pop(member_id, None)

    @staticmethod
    def refresh(data: ShareGroupData, topics: TopicView, *, bump: bool = False) -> None:
        """Bump the group epoch (once) on a membership/subscription change or when the subscribed
        topics' metadata changed; recompute the target when it is older than the group epoch."""
        names = data.subscribed_topics(topics)
        signature = tuple(sorted((n, str(topics[n].topic_id), topics[n].partitions) for n in names))
        if signature != data.topics_signature:
            data.topics_signature = signature
            bump = True
        if bump:
            data.group_epoch += 1
        if data.assignment_epoch >= data.group_epoch and set(data.target) == set(data.members):
            return
        subscriptions = {
            mid: frozenset(topics[n].topic_id for n in m.subscribed_topic_names if n in topics)
            for mid, m in data.members.items()
        }
        counts = {topics[n].topic_id: topics[n].partitions for n in names}
        data.target = simple_assign(subscriptions, counts, data.target)
        data.assignment_epoch = data.group_epoch

    @staticmethod
    def deadlines(data: ShareGroupData, session_timeout_ms: int) -> Iterable[int]:
        for m in data.members.values():
            yield m.last_heartbeat_ms + session_timeout_ms

    def expire(self, data: ShareGroupData, session_timeout_ms: int, topics: TopicView, now_ms: int) -> list[str]:
        """Remove members whose session ran out; their ids."""
        gone = [m.member_id for m in data.members.values() if now_ms >= m.last_heartbeat_ms + session_timeout_ms]
        for member_id in gone:
            self.remove(data, member_id)
        if gone:
            self.refresh(data, topics, bump=True)
        return gone
