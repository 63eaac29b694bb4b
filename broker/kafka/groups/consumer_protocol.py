"""The consumer protocol embedded in classic JoinGroup/SyncGroup bytes: Kafka's
ConsumerProtocolSubscription (a member's topics, owned partitions, rack) and
ConsumerProtocolAssignment (its partitions), versions 0-3, read and written.

The classic coordinator treats these bytes as opaque; a KIP-848 group that serves classic
members (online migration, migration.py) reads their subscriptions and writes their
assignments itself, as Kafka's coordinator does. Newer versions are read as the newest one
known (Kafka appends fields only), so a future client still joins.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_VERSION = 3


class ProtocolError(ValueError):
    """Bytes that are not a consumer protocol subscription or assignment."""


@dataclass(frozen=True, slots=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    owned: tuple[tuple[str, int], ...]  # v1+: partitions the member still owns (cooperative clients)
    generation_id: int  # v2+, else -1
    rack_id: str | None  # v3+


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def _take(self, fmt: str) -> int:
        try:
            (value,) = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise ProtocolError("truncated consumer protocol bytes") from None
        self.pos += struct.calcsize(fmt)
        return int(value)

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def string(self) -> str | None:
        n = self.int16()
        if n < 0:
            return None
        if self.pos + n > len(self.data):
            raise ProtocolError("truncated string")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ProtocolError("string is not UTF-8") from None

    def skip_bytes(self) -> None:
        n = self.int32()
        if n > 0:
            if self.pos + n > len(self.data):
                raise ProtocolError("truncated bytes")
            self.pos += n

    def count(self) -> int:
        n = self.int32()
        if n > len(self.data) - self.pos:  # every element takes at least one byte
            raise ProtocolError(f"array length {n} beyond the data")
        return max(n, 0)

    def topic_partitions(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for _ in range(self.count()):
            topic = self.string()
            if topic is None:
                raise ProtocolError("null topic name")
            out.extend((topic, self.int32()) for _ in range(self.count()))
        return out


def parse_subscription(data: bytes) -> Subscription:
    r = _Reader(bytes(data))
    version = r.int16()
    if version < 0:
        raise ProtocolError(f"subscription version {version}")
    topics: list[str] = []
    for _ in range(r.count()):
        name = r.string()
        if name is None:
            raise ProtocolError("null topic name")
        topics.append(name)
    r.skip_bytes()  # user data (the client-side assignor's; a server-side assignment ignores it)
    owned: list[tuple[str, int]] = []
    generation, rack = -1, None
    # older clients of a version may stop early; what is absent keeps its default
    if version >= 1 and not r.done():
        owned = r.topic_partitions()
    if version >= 2 and not r.done():
        generation = r.int32()
    if version >= 3 and not r.done():
        rack = r.string()
    return Subscription(version, tuple(topics), tuple(owned), generation, rack)


def subscription_version(data: bytes) -> int:
    """The version an assignment for this member is written in (Kafka: the subscription's)."""
    if len(data) < 2:
        return 0
    return min(max(struct.unpack_from(">h", data)[0], 0), MAX_VERSION)


def parse_assignment(data: bytes) -> list[tuple[str, int]]:
    """(topic, partition) of a ConsumerProtocolAssignment; b"" (no assignment yet) is []."""
    if not data:
        return []
    r = _Reader(bytes(data))
    if r.int16() < 0:
        raise ProtocolError("negative assignment version")
    return r.topic_partitions()


def encode_assignment(version: int, partitions: Mapping[str, Iterable[int]]) -> bytes:
    out = bytearray(struct.pack(">hi", min(max(version, 0), MAX_VERSION), len(partitions)))
    for topic in sorted(partitions):
        name = topic.encode()
        ps = sorted(partitions[topic])
        out += struct.pack(">h", len(name)) + name + struct.pack(">i", len(ps))
        out += struct.pack(f">{len(ps)}i", *ps)
    out += struct.pack(">i", -1)  # no user data
    return bytes(out)
