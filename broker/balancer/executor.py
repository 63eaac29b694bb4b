"""Applying a proposal: partition moves through the standard Kafka reassignment API.

Each move is AlterPartitionReassignments with the target as the only replica (the broker
hands it to the controller's reassignment path: the old leader uploads and closes, the new
one opens under a higher epoch). A move is finished when ListPartitionReassignments no
longer lists it, Metadata names the target as leader, and the target answers ListOffsets
for the partition: the new leader serves.

At most `max_concurrent` moves run at once. A move is never left half-done without saying
so: before starting, the executor checks the partition is still where the plan saw it (a
stale plan is reported, not applied); a move that ends somewhere else or fails to start
for a transient reason is retried up to `attempts` times; one still running at its
deadline is reported as such (a started move cannot be cancelled; the controller
completes it, or places the partition elsewhere if the target dies).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.balancer.kafka_admin import KafkaAdmin, KafkaAdminError
from automq.broker.balancer.planner import Move

log = logging.getLogger(__name__)

# worth another attempt: the move did not start, or the cluster was briefly unsure
_RETRIABLE = frozenset(
    {
        ErrorCode.request_timed_out,
        ErrorCode.not_controller,
        ErrorCode.broker_not_available,
        ErrorCode.leader_not_available,
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_server_error,
        ErrorCode.kafka_storage_error,
    }
)


@dataclass(frozen=True, slots=True)
class MoveResult:
    move: Move
    ok: bool
    seconds: float
    attempts: int
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "move": asdict(self.move),
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
            "error": self.error,
        }


class MoveExecutor:
    def __init__(
        self,
        admin: KafkaAdmin,
        *,
        max_concurrent: int = 4,
        move_timeout_s: float = 60.0,
        attempts: int = 3,
        poll_s: float = 0.1,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.admin = admin
        self.max_concurrent = max_concurrent
        self.move_timeout_s = move_timeout_s
        self.attempts = attempts
        self.poll_s = poll_s
        self.in_flight: set[tuple[str, int]] = set()  # for status reporting by the caller

    async def execute(self, moves: Sequence[Move]) -> list[MoveResult]:
        """Run the moves (bounded concurrency); results in the order of `moves`."""
        gate = asyncio.Semaphore(self.max_concurrent)

        async def bounded(move: Move) -> MoveResult:
            async with gate:
                self.in_flight.add(move.key)
                try:
                    return await self.move(move)
                finally:
                    self.in_flight.discard(move.key)

        return list(await asyncio.gather(*(bounded(m) for m in moves)))

    async def move(self, move: Move) -> MoveResult:
        started = time.monotonic()
        deadline = started + self.move_timeout_s
        error: str | None = "not attempted"
        attempt = 0
        while attempt < self.attempts and time.monotonic() < deadline:
            attempt += 1
            try:
                done, error, retry = await self._attempt(move, deadline, first=attempt == 1)
            except KafkaAdminError as exc:
                done, error, retry = False, str(exc), True
            if done:
                log.info("moved %s-%d %d -> %d", move.topic, move.partition, move.source, move.target)
                return MoveResult(move, True, time.monotonic() - started, attempt)
            if not retry:
                break
            log.warning("move of %s-%d to %d: %s; retrying", move.topic, move.partition, move.target, error)
            await asyncio.sleep(min(0.5 * attempt, max(0.0, deadline - time.monotonic())))
        log.error("move of %s-%d to %d failed: %s", move.topic, move.partition, move.target, error)
        return MoveResult(move, False, time.monotonic() - started, attempt, error)

    async def _attempt(self, move: Move, deadline: float, first: bool) -> tuple[bool, str | None, bool]:
        """(done, why not, worth retrying)."""
        key = move.key
        ongoing = await self.admin.ongoing_reassignments([key])
        # someone (an earlier attempt, another tool) is moving it: let that finish first
        if key in ongoing and not await self._until_not_moving(key, deadline):
            return False, f"still moving to {ongoing[key]} at the deadline", False
        md = await self.admin.metadata([move.topic])
        if move.topic in md.topic_errors:
            return False, f"topic {move.topic}: {md.topic_errors[move.topic].name}", False
        leader = md.leaders.get(key)
        if leader is None:
            return False, f"partition {move.topic}-{move.partition} no longer exists", False
        if leader == move.target:
            return await self._serving(move, deadline)
        if first and leader not in (move.source, -1):  # a retry moves it from wherever our move left it
            return False, f"leader is now {leader}, not {move.source} as planned (plan is stale; not moved)", False
        try:
            await self.admin.alter_reassignment(move.topic, move.partition, move.target)
        except KafkaAdminError as exc:
            if exc.code == ErrorCode.reassignment_in_progress:
                return False, str(exc), True
            return False, str(exc), exc.code is None or exc.code in _RETRIABLE
        if not await self._until_not_moving(key, deadline):
            return False, f"still moving at the {self.move_timeout_s:g}s deadline (the controller completes it)", False
        leader = (await self.admin.metadata([move.topic])).leaders.get(key)
        if leader != move.target:
            return False, f"the move ended on broker {leader}, not {move.target}", True
        return await self._serving(move, deadline)

    async def _until_not_moving(self, key: tuple[str, int], deadline: float) -> bool:
        while time.monotonic() < deadline:
            if key not in await self.admin.ongoing_reassignments([key]):
                return True
            await asyncio.sleep(self.poll_s)
        return False

    async def _serving(self, move: Move, deadline: float) -> tuple[bool, str | None, bool]:
        """The target leads per metadata; wait until it answers for the partition."""
        code = ErrorCode.none
        while True:
            try:
                code = await self.admin.serves(move.target, move.topic, move.partition)
            except KafkaAdminError as exc:
                if time.monotonic() >= deadline:
                    return False, f"broker {move.target} does not answer: {exc}", False
            else:
                if code == ErrorCode.none:
                    return True, None, False
            if time.monotonic() >= deadline:
                return False, f"broker {move.target} leads but does not serve yet ({code.name})", False
            await asyncio.sleep(self.poll_s)
