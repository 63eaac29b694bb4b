"""Partition moves the operator makes: through the controller's reassignment path, bounded.

A move is what `AlterPartitionReassignments` does on a broker: the controller marks the
partition moving to the target, the old leader closes its stream (its WAL data already
committed), the target opens it under a new epoch. The operator asks the controller directly
(it already talks to it for drains) and counts a move finished only when
  1. the controller's metadata names the target as the leader, online, and
  2. the target itself serves it: its /metrics lists the partition's series, which a broker
     creates when it opens a partition and removes when it closes it.
A move that fails or does not finish within `timeout_s` is reported as failed with why; the
controller keeps whatever state it reached (a move it accepted completes on its own or is
handed to another broker if the target dies), and the balancer proposes it again later.

At most `max_concurrent` moves are in flight at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from automq.broker.balancer.planner import Move
from automq.broker.controller.protocol import MetadataImage, PartitionInfo
from automq.operator.controller_api import ControllerApi, ControllerApiError


@dataclass(frozen=True, slots=True)
class MoveOutcome:
    move: Move
    ok: bool
    seconds: float
    error: str | None = None


# Whether the target broker serves the partition now (its /metrics lists it).
ServesCheck = Callable[[Move], Awaitable[bool]]


async def execute_moves(
    api: ControllerApi,
    moves: Sequence[Move],
    *,
    max_concurrent: int,
    timeout_s: float = 60.0,
    poll_s: float = 0.25,
    serves: ServesCheck | None = None,
) -> list[MoveOutcome]:
    """Run `moves`, at most `max_concurrent` at a time; one outcome per move, in order."""
    gate = asyncio.Semaphore(max(1, max_concurrent))

    async def one(move: Move) -> MoveOutcome:
        async with gate:
            start = time.monotonic()
            try:
                await asyncio.wait_for(_move(api, move, poll_s, serves), timeout_s)
            except TimeoutError:
                return MoveOutcome(move, False, time.monotonic() - start, f"not finished within {timeout_s:.0f}s")
            except ControllerApiError as exc:
                return MoveOutcome(move, False, time.monotonic() - start, str(exc))
            return MoveOutcome(move, True, time.monotonic() - start)

    return list(await asyncio.gather(*(one(m) for m in moves)))


async def _move(api: ControllerApi, move: Move, poll_s: float, serves: ServesCheck | None) -> None:
    image = await api.metadata()
    current = _partition(image, move)
    if current is None:
        raise ControllerApiError(f"{move.topic}-{move.partition} no longer exists")
    if not (current.leader == move.target and current.state == "online"):
        if current.state in ("moving", "offline") and current.target == move.target:
            pass  # ours from an earlier attempt: wait for it
        elif current.leader != move.source:
            raise ControllerApiError(
                f"{move.topic}-{move.partition} is led by broker {current.leader}, not {move.source}, since it was planned"
            )
        else:
            await api.reassign_partition(move.topic, move.partition, move.target)
    while True:
        image = await api.metadata()
        current = _partition(image, move)
        if current is None:
            raise ControllerApiError(f"{move.topic}-{move.partition} was deleted while moving")
        if current.leader == move.target and current.state == "online":
            if serves is None or await serves(move):
                return
        elif current.state == "offline" and current.target == move.target:
            # The old leader was fenced mid-move: the move resumes once its WAL is back or
            # recovered (the controller keeps the target); a timeout reports it meanwhile.
            pass
        elif current.state != "moving" and current.leader != move.source:
            raise ControllerApiError(
                f"{move.topic}-{move.partition} went to broker {current.leader} instead of {move.target}"
            )
        await asyncio.sleep(poll_s)


def _partition(image: MetadataImage, move: Move) -> PartitionInfo | None:
    for topic in image.topics:
        if topic.name == move.topic:
            for p in topic.partitions:
                if p.partition == move.partition:
                    return p
    return None
