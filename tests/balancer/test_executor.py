"""MoveExecutor's failure paths, driven by a scripted admin (the happy path and stale plans run
against a real cluster in tests/e2e/test_rebalance.py)."""

from kio.schema.errors import ErrorCode

from automq.broker.balancer.executor import MoveExecutor
from automq.broker.balancer.kafka_admin import KafkaAdminError, KafkaMetadata
from automq.broker.balancer.planner import Move

KEY = ("t", 0)


class ScriptedAdmin:
    """Leader of t-0 and the outcome of each AlterPartitionReassignments, as scripted."""

    def __init__(self, leader: int, outcomes: list) -> None:
        self.leader = leader
        self.outcomes = outcomes  # per alter call: ("move", broker) | ("stuck",) | KafkaAdminError
        self.moving_until_polls = 0
        self.alters = 0

    async def ongoing_reassignments(self, keys=None):
        if self.moving_until_polls > 0:
            self.moving_until_polls -= 1
            return {KEY: 2}
        return {}

    async def metadata(self, topics=None):
        return KafkaMetadata({}, {KEY: self.leader}, {}, {})

    async def alter_reassignment(self, topic, partition, target):
        self.alters += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if outcome[0] == "move":
            self.moving_until_polls = 2
            self.leader = outcome[1]
        else:
            self.moving_until_polls = 10**9

    async def serves(self, broker, topic, partition):
        return ErrorCode.none if broker == self.leader else ErrorCode.not_leader_or_follower


def executor(admin, **kw):
    return MoveExecutor(admin, poll_s=0.001, **kw)


async def test_transient_error_is_retried_then_succeeds():
    admin = ScriptedAdmin(1, [KafkaAdminError("REQUEST_TIMED_OUT", ErrorCode.request_timed_out), ("move", 2)])
    (r,) = await executor(admin, attempts=3).execute([Move("t", 0, 1, 2, "network")])
    assert r.ok and r.attempts == 2 and admin.alters == 2


async def test_a_move_that_ended_elsewhere_is_retried_from_where_it_is():
    admin = ScriptedAdmin(1, [("move", 3), ("move", 2)])
    (r,) = await executor(admin, attempts=3).execute([Move("t", 0, 1, 2, "network")])
    assert r.ok and r.attempts == 2


async def test_a_move_still_running_at_the_deadline_is_reported_not_forgotten():
    admin = ScriptedAdmin(1, [("stuck",)])
    (r,) = await executor(admin, move_timeout_s=0.2).execute([Move("t", 0, 1, 2, "network")])
    assert not r.ok and "still moving" in r.error and admin.alters == 1


async def test_a_permanent_error_is_reported_without_retrying():
    admin = ScriptedAdmin(1, [KafkaAdminError("INVALID_REPLICA_ASSIGNMENT", ErrorCode.invalid_replica_assignment)])
    (r,) = await executor(admin, attempts=3).execute([Move("t", 0, 1, 2, "network")])
    assert not r.ok and "INVALID_REPLICA_ASSIGNMENT" in r.error and r.attempts == 1


async def test_attempts_are_bounded():
    errors = [KafkaAdminError("conn reset") for _ in range(5)]
    admin = ScriptedAdmin(1, errors)
    (r,) = await executor(admin, attempts=2).execute([Move("t", 0, 1, 2, "network")])
    assert not r.ok and r.attempts == 2 and admin.alters == 2
